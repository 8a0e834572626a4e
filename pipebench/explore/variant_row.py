"""A measured variant at one setting: a row of explore.csv, built once from the sweep's summaries and
read by field by the conclusions, the winner and its waterfall."""

from dataclasses import dataclass
from typing import Optional

# The base chain's verdict: the reference every variant is checked and measured against.
BASE_VERDICT = "base"


@dataclass(frozen=True)
class VariantRow:
    """Medians over the rounds of one chain at one setting, its ratios over the base chain and whether
    each differs from it for real (significance's direction, or `base` / `-`)."""

    variant: str
    setting: str
    verdict: str
    rounds: int
    samples_per_s: float
    samples_per_s_min: float
    samples_per_s_max: float
    speedup: float
    rate_vs_base: str
    cpu_ms_per_sample: float
    cpu_ms_min: float
    cpu_ms_max: float
    cpu_speedup: float
    cpu_vs_base: str
    # The epoch-effective rate (what persistent_workers pays through) and the batch that crosses the
    # worker boundary with what delivering a finished one costs (what late_cast pays through).
    samples_per_s_epoch: Optional[float]
    batch_mb: Optional[float]
    ready_next_ms: Optional[float]
