"""The one rule for "is this change real?", used by compare, explore, tune and (through
pipebench.model.judging) the comparison table.

A change between two sets of measurements (rounds, repeats) is *real* when it is significant
**and** larger than a threshold, in the manner of asv:

- `significant`: the percentile-bootstrap 95% interval of the ratio of medians excludes 1 **and**
  a t-test on the logarithms gives p < ALPHA (after Holm's correction when several jobs are tested
  at once). Paired samples (A/B rounds measured side by side) use the paired test on the per-round
  log ratios and resample whole pairs, so drift between rounds cancels.
- `noisy`: not real, but the change is larger than the threshold, or the interval's half-width is
  (the samples cannot tell a change of `threshold` from none);
- `no change` otherwise.

Why a t-test on logs and not Mann–Whitney: with 5 rounds a side the exact Mann–Whitney p cannot go
below 0.008, so after Holm over the 8 jobs of a night (smallest level 0.05/8 = 0.006) no job could
ever be flagged. The t-test's p is continuous; ratios are tested on logs because throughput and
CPU time are positive and multiplicative. An outlier widens the t-test's variance, so it errs
towards `noisy`, never towards a false verdict.
"""

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

# Two-sided level of the test, for the whole family of jobs when Holm's correction is applied.
ALPHA = 0.05
# Percentile bootstrap of the ratio of medians: 95% two-sided; 2000 resamples is plenty for a
# 2.5%/97.5% percentile and costs milliseconds; a fixed seed makes reruns give the same interval.
CONFIDENCE = 0.95
N_BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0

# Fewest samples a side for a verdict. With 3, a median's bootstrap interval has a handful of
# distinct values and a t-test's variance 2 degrees of freedom: measured, 3 vs 3 at 25% CV called
# a false `faster` in 1 of 50 A/A draws. With 4 or more a side it called none (tests/test_compare.py).
MIN_SAMPLES = 4

UP, DOWN, NO_CHANGE, NOISY = "up", "down", "no change", "noisy"


@dataclass(frozen=True)
class Change:
    """head / base: the ratio of medians, its interval, the raw p, and how large the change is."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    threshold: float

    def direction(self, p_adjusted: float) -> str:
        """UP or DOWN when the change is real, else NOISY or NO_CHANGE (module docstring)."""
        significant = (self.ci_low > 1 or self.ci_high < 1) and p_adjusted < ALPHA
        large = abs(self.ratio - 1) > self.threshold
        if significant and large:
            return UP if self.ratio > 1 else DOWN
        if large or (self.ci_high - self.ci_low) / 2 > self.threshold:
            return NOISY
        return NO_CHANGE


def _p_value(base: np.ndarray, head: np.ndarray, paired: bool) -> float:
    # Imported here: scipy.stats costs every job process and every CLI start about a second.
    from scipy.stats import ttest_1samp, ttest_ind

    if min(len(base), len(head)) < MIN_SAMPLES:
        return 1.0  # too few to tell a change from noise (MIN_SAMPLES)
    lb, lh = np.log(base), np.log(head)
    if paired:
        diffs = lh - lb
        if np.ptp(diffs) == 0:
            return 0.0 if diffs[0] != 0 else 1.0
        return float(ttest_1samp(diffs, 0.0).pvalue)
    if np.ptp(lb) == 0 and np.ptp(lh) == 0:
        return 0.0 if lb[0] != lh[0] else 1.0
    return float(ttest_ind(lh, lb, equal_var=False).pvalue)


def bootstrap_ratio(base: np.ndarray, head: np.ndarray, paired: bool, rng: np.random.Generator,
                    factors: np.ndarray) -> Tuple[float, float]:
    """Percentile interval of factor x median(head) / median(base); pairs resampled together."""
    if paired:
        picks = rng.integers(0, len(base), size=(N_BOOTSTRAP, len(base)))
        mb, mh = np.median(base[picks], axis=1), np.median(head[picks], axis=1)
    else:
        mb = np.median(rng.choice(base, size=(N_BOOTSTRAP, len(base))), axis=1)
        mh = np.median(rng.choice(head, size=(N_BOOTSTRAP, len(head))), axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(factors * mh / mb, [tail, 100 - tail])
    return float(low), float(high)


def measure_change(base: Sequence[float], head: Sequence[float], threshold: float, paired: bool = False,
                   factor: float = 1.0, factors: Optional[np.ndarray] = None, seed: int = BOOTSTRAP_SEED) -> Change:
    """The change from `base` to `head` (positive values), scaled by a constant `factor` (and its
    resampled `factors` for the interval) when one side must be normalised."""
    b, h = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    if paired and len(b) != len(h):
        raise ValueError(f"paired samples differ in length: {len(b)} and {len(h)}")
    rng = np.random.default_rng(seed)
    scale = np.full(N_BOOTSTRAP, factor) if factors is None else factors
    low, high = bootstrap_ratio(b, h, paired, rng, scale)
    ratio = factor * float(np.median(h) / np.median(b))
    return Change(ratio, low, high, _p_value(b, h * factor, paired), threshold)


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values: reject where adjusted p < ALPHA keeps the chance of any
    false verdict in the family at ALPHA. NaN stays NaN and does not count as a test."""
    order = [i for i in np.argsort(p_values) if not np.isnan(p_values[i])]
    m = len(order)
    adjusted = [float("nan")] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def against_base(base: Mapping[int, float], others: Mapping[str, Mapping[int, float]],
                 threshold: float = 0.0) -> Dict[str, Tuple[Change, str]]:
    """Each of `others` against `base` (values keyed by round, interleaved in one sweep): the change
    and its direction under the rule above, paired over the rounds both sides ran when that is
    every round of each (drift between rounds then cancels), and with Holm's correction over the
    family, as a sweep of K variants makes K comparisons against one base."""
    changes = {}
    for name, values in others.items():
        paired = sorted(values) == sorted(base) and len(base) > 1
        order = sorted if paired else list  # paired: both sides round by round
        changes[name] = measure_change([base[r] for r in order(base)], [values[r] for r in order(values)],
                                       threshold, paired)
    adjusted = holm([c.p_value for c in changes.values()])
    return {name: (change, change.direction(p)) for (name, change), p in zip(changes.items(), adjusted)}


def separated(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether `a` and `b` (rounds of two jobs) differ for real at any size: the rule above with a
    zero threshold, unpaired and uncorrected; one round a side can never separate."""
    if min(len(a), len(b)) < 2:
        return False
    change = measure_change(b, a, 0.0)
    return change.direction(change.p_value) in (UP, DOWN)
