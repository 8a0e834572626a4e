"""Summary statistics of per-step samples: the median and a spread, with mean and variance kept too."""

import math
import sys
from dataclasses import dataclass
from typing import Sequence, Tuple

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
        nan = float("nan")
        return Distribution(0, nan, nan, nan, nan, nan, nan, nan, nan)
    p25, median, p75, p99 = np.percentile(data, [LOWER_QUARTILE, 50, UPPER_QUARTILE, TAIL_PERCENTILE])
    return Distribution(
        n=int(data.size),
        mean=float(data.mean()),
        var=float(data.var(ddof=1)) if data.size > 1 else 0.0,
        median=float(median),
        p25=float(p25),
        p75=float(p75),
        p99=float(p99),
        min=float(data.min()),
        max=float(data.max()),
    )


# The largest x whose e^x is a float: a log-scale bound beyond it is infinite.
MAX_EXPONENT = math.log(sys.float_info.max)
# Resamples of the studentized block bootstrap: the t quantiles settle well below 1% by 2000.
BLOCK_BOOTSTRAP_RESAMPLES = 2000
# Fewer whole blocks than this and the bootstrap's own t distribution is too coarse to read a
# 2.5% tail from; the batch-means t interval (the same studentized ratio, t quantiles from
# theory) takes over, and below two blocks there is no spread to estimate at all.
MIN_BOOTSTRAP_BLOCKS = 4
MIN_BLOCKS = 2
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class RatioInterval:
    """Σ numerator / Σ denominator over whole blocks, and its interval. `blocks`: how many.
    `note`: why the interval is not the studentized one, empty when it is."""

    value: float
    low: float
    high: float
    blocks: int
    note: str = ""


# What a row's note says when the studentized interval left out its own estimate (its t
# distribution skewed to one side), or had a bound of 0 or infinity on the log scale (resamples of
# nearly equal blocks have a standard error near 0, so a t of thousands), and the percentile
# interval over the same resamples replaced it.
PERCENTILE_FALLBACK_NOTE = "percentile interval: the studentized one excluded the estimate or had no finite bound"
# ... and when even that one did: the bound nearest the estimate is moved to it.
WIDENED_NOTE = "percentile interval widened to hold the estimate: both bootstrap intervals excluded it"


def _holding_the_estimate(value: float, studentized: Tuple[float, float], ratios: np.ndarray,
                          tail: float, blocks: int) -> RatioInterval:
    """The studentized interval, or the percentile one over the same resamples where the former
    leaves out `value` (a reader seeing an estimate outside its own interval sees a broken tool) or
    has a bound of 0 or infinity."""
    low, high = studentized
    if 0 < low <= value <= high < math.inf:
        return RatioInterval(value, low, high, blocks)
    low, high = (float(q) for q in np.percentile(ratios, [100 * tail, 100 * (1 - tail)]))
    if low <= value <= high:
        return RatioInterval(value, low, high, blocks, PERCENTILE_FALLBACK_NOTE)
    return RatioInterval(value, min(low, value), max(high, value), blocks, WIDENED_NOTE)


def _ratio_and_se(numer: np.ndarray, denom: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Ratio of sums over the last axis and its delta-method standard error (the linearised ratio)."""
    ratio = numer.sum(axis=-1) / denom.sum(axis=-1)
    residual = (numer - ratio[..., None] * denom) / denom.mean(axis=-1)[..., None]
    return ratio, residual.std(axis=-1, ddof=1) / np.sqrt(numer.shape[-1])


def block_ratio_interval(numer_blocks: np.ndarray, denom_blocks: np.ndarray,
                         confidence: float = 0.95) -> RatioInterval:
    """An interval of Σ numer / Σ denom from per-block sums, by a studentized block bootstrap.

    Steps of a loader are not independent: W workers started together deliver W batches, then
    the loop waits a whole cycle. Summed over whole cycles (the blocks), the series is close to
    independent, so resampling blocks follows run-to-run variation where resampling steps reads
    10x too narrow or too wide. The studentized (bootstrap-t) interval keeps its coverage with
    as few as 8 blocks, where the percentile interval falls to ~87% (tests/test_block_bootstrap.py).
    The ratio is studentized on the log scale (its standard error there is se / ratio), so both
    bounds of a rate are positive: on the ratio's own scale, 2 to 4 noisy blocks gave a samples/s
    interval below zero in 23-57% of simulated runs (a `run=quick` row read -66827–24577 around 7000).
    """
    numer = np.asarray(numer_blocks, dtype=np.float64)
    denom = np.asarray(denom_blocks, dtype=np.float64)
    n = numer.size
    if n == 0:
        nan = float("nan")
        return RatioInterval(nan, nan, nan, 0)
    value = float(numer.sum() / denom.sum())
    if n < MIN_BLOCKS:
        return RatioInterval(value, float("nan"), float("nan"), n)
    se0 = float(_ratio_and_se(numer[None], denom[None])[1][0])
    tail = (1 - confidence) / 2
    if se0 == 0:  # also where every numerator is 0: the log scale needs a positive ratio
        return RatioInterval(value, value, value, n)
    log_se0 = se0 / value
    if n < MIN_BOOTSTRAP_BLOCKS:
        q = float(stdtrit(n - 1, 1 - tail))
        return RatioInterval(value, *_log_scale_bounds(value, log_se0, -q, q), n)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, n, size=(BLOCK_BOOTSTRAP_RESAMPLES, n))
    ratios, ses = _ratio_and_se(numer[picks], denom[picks])
    usable = ses > 0
    t_stats = np.log(ratios[usable] / value) / (ses[usable] / ratios[usable])
    q_low, q_high = np.percentile(t_stats, [100 * tail, 100 * (1 - tail)])
    studentized = _log_scale_bounds(value, log_se0, -float(q_high), -float(q_low))
    return _holding_the_estimate(value, studentized, ratios, tail, n)


def _log_scale_bounds(value: float, log_se: float, t_low: float, t_high: float) -> Tuple[float, float]:
    """value·e^(t·log_se) for each t: the interval's bounds from its t quantiles on the log scale;
    a bound past the float range is infinite (one below it is 0)."""
    return tuple(value * math.exp(t * log_se) if t * log_se < MAX_EXPONENT else math.inf
                 for t in (t_low, t_high))
