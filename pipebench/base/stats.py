"""Summary statistics of per-step samples: the median and a spread, with mean and variance kept too."""

import math
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np
# scipy.special, not scipy.stats: the same quantile, and a second less to import in every job process.
from scipy.special import stdtrit

# Percentiles that bound the IQR, and the tail users ask about for stalls.
LOWER_QUARTILE, UPPER_QUARTILE, TAIL_PERCENTILE = 25, 75, 99


@dataclass(frozen=True)
class Distribution:
    """A sample of times in milliseconds. `var` is the sample variance (ddof=1), 0 for one value."""

    n: int
    mean: float
    var: float
    median: float
    p25: float
    p75: float
    p99: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25


def distribution(values: Sequence[float]) -> Distribution:
    """Summarise values; an empty sample gives NaNs so it can never pass for a measurement."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return Distribution(0, *[float("nan")] * 8)
    p25, median, p75, p99 = np.percentile(data, [LOWER_QUARTILE, 50, UPPER_QUARTILE, TAIL_PERCENTILE])
    var = float(data.var(ddof=1)) if data.size > 1 else 0.0
    return Distribution(int(data.size), float(data.mean()), var,
                        *map(float, (median, p25, p75, p99, data.min(), data.max())))


# The largest x whose e^x is a float: a log-scale bound beyond it is infinite.
MAX_EXPONENT = math.log(sys.float_info.max)
# Below two whole blocks there is no spread to estimate at all.
MIN_BLOCKS = 2
# Why a rate has no interval: fewer blocks than MIN_BLOCKS.
TOO_FEW_BLOCKS_NOTE = f"no interval: fewer than {MIN_BLOCKS} whole worker cycles measured"


@dataclass(frozen=True)
class RatioInterval:
    """Σ numerator / Σ denominator over whole blocks, and its interval. `blocks`: how many.
    `note`: why there is no interval, empty when there is one."""

    value: float
    low: float
    high: float
    blocks: int
    note: str = ""


def block_ratio_interval(numer_blocks: np.ndarray, denom_blocks: np.ndarray,
                         confidence: float = 0.95) -> RatioInterval:
    """An interval of Σ numer / Σ denom from per-block sums: the method of batch means, a t
    interval of the ratio on the log scale.

    Steps of a loader are not independent: W workers started together deliver W batches, then
    the loop waits a whole cycle. Summed over whole cycles (the blocks), the series is close to
    independent, so the blocks' spread follows run-to-run variation where the steps' reads 10x too
    narrow or too wide. On the log scale both bounds of a rate are positive.

    Not a bootstrap: one slow block (a hiccup of the host) among 8-30 makes the resamples without
    it nearly constant, so a studentized block bootstrap read 3.6-4.7x the run-to-run spread (issue
    41); this interval's median half-width is 2.1-2.7 standard deviations of the rate, at 93-96%
    coverage from 4 blocks up (tests/test_rate_interval.py).
    """
    numer = np.asarray(numer_blocks, dtype=np.float64)
    denom = np.asarray(denom_blocks, dtype=np.float64)
    n = numer.size
    nan = float("nan")
    if n == 0:
        return RatioInterval(nan, nan, nan, 0, TOO_FEW_BLOCKS_NOTE)
    value = float(numer.sum() / denom.sum())
    if n < MIN_BLOCKS:
        return RatioInterval(value, nan, nan, n, TOO_FEW_BLOCKS_NOTE)
    # The ratio's delta-method standard error (the linearised ratio).
    se = float(((numer - value * denom) / denom.mean()).std(ddof=1) / np.sqrt(n))
    if se == 0:  # also where every numerator is 0: the log scale needs a positive ratio
        return RatioInterval(value, value, value, n)
    # value·e^(∓q·se/value): the bounds on the log scale; a bound past the float range is infinite.
    spread = float(stdtrit(n - 1, 1 - (1 - confidence) / 2)) * (se / value)
    high = value * math.exp(spread) if spread < MAX_EXPONENT else math.inf
    return RatioInterval(value, value * math.exp(-spread), high, n)
