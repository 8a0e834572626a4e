"""Summary statistics of per-step samples: the median and a spread, with mean and variance kept too."""

from dataclasses import dataclass
from typing import Sequence

import numpy as np

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
