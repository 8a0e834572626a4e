"""Is a recorded window a stall? The run's own baseline, and a window judged against it.

A window is judged against the last BASELINE_WINDOWS windows that were not stalls (so a run whose
pace changes for good becomes the new baseline once its windows are no longer stalls). It is a stall when
- its starvation lies above the baseline's one-sided prediction bound (the t quantile of n-1 degrees
  of freedom, as `base.stats` takes its intervals) **and** rose by at least `min_rise_pct` points
  over the baseline's median (a minimum effect, as `base.significance` asks of every change), or
- its samples/s lies below the baseline's prediction bound on the log scale (rates are positive and
  multiplicative) **and** fell by at least `min_drop` of the median.

An epoch's first batch is no step of any window: its wait less a baseline step's wait is the cost of
an epoch-start event, a stall (`EPOCH_START`) when at least `epoch_min_s` and `epoch_min_steps`
baseline steps.
"""

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, Optional, Tuple

import numpy as np
from scipy.special import stdtrit

from pipebench.measure.series_window import WindowFigures

__all__ = ["EPOCH_START", "RATE_DROP", "STARVATION_RISE", "Baseline", "StallRule", "Verdict"]

STARVATION_RISE, RATE_DROP, EPOCH_START = "starvation", "rate", "epoch_start"
# One-sided level of the prediction bound. A week of 30 s windows is 20,160 judgements: at 0.05
# a steady run would cross the bound a thousand times, and only the minimum effect would hold them.
STALL_ALPHA = 0.001
# The case is a rise from ~0 to 30% starvation; half of it catches a stall that began
# mid-window (its first window half stalled), and a rise of 15 points is no window-to-window noise
# of a loader that keeps up (the prediction bound judges the noise; this is the least effect).
DEFAULT_MIN_RISE_PCT = 15.0
# A rate 25% below the baseline's median: the loop lost a quarter of its pace.
DEFAULT_MIN_DROP = 0.25
# The baseline's windows: enough for the t quantile to settle (t(0.999, 19) = 3.58 against 3.09
# with the noise known), few enough to follow a run whose pace changes for good.
BASELINE_WINDOWS = 20
# No judgement before this many baseline windows: two windows give no spread worth a bound.
MIN_BASELINE_WINDOWS = 3
# An epoch start is a stall when its cost is at least 1 s and 10 steps of the baseline's: a 30 s
# start every epoch is one; a new epoch that costs a step or two (persistent workers) is not.
DEFAULT_EPOCH_MIN_S = 1.0
DEFAULT_EPOCH_MIN_STEPS = 10.0


@dataclass(frozen=True)
class StallRule:
    """The stall rule's settings (user-settable: `--stall-rise`, `--stall-drop`)."""

    min_rise_pct: float = DEFAULT_MIN_RISE_PCT
    min_drop: float = DEFAULT_MIN_DROP
    alpha: float = STALL_ALPHA
    epoch_min_s: float = DEFAULT_EPOCH_MIN_S
    epoch_min_steps: float = DEFAULT_EPOCH_MIN_STEPS

    def __post_init__(self) -> None:
        if not (self.min_rise_pct > 0 and 0 < self.min_drop < 1 and 0 < self.alpha < 0.5 and self.epoch_min_s >= 0
                and self.epoch_min_steps >= 0):
            raise ValueError(f"a stall rule needs min_rise_pct > 0, 0 < min_drop < 1 and 0 < alpha < 0.5, not {self}")


@dataclass(frozen=True)
class Verdict:
    """A stalled window: which rule it broke, the baseline it broke it against, and the time it lost
    (the wait beyond the baseline's share, or the time beyond the baseline's rate), in seconds."""

    kind: str
    baseline_starvation_pct: float
    baseline_samples_per_s: float
    lost_s: float


def _upper_bound(values: np.ndarray, alpha: float) -> float:
    """The one-sided 1 - alpha prediction bound of a new value from `values`' distribution."""
    n = len(values)
    spread = float(values.std(ddof=1)) if n > 1 else 0.0
    return float(values.mean()) + float(stdtrit(n - 1, 1 - alpha)) * spread * math.sqrt(1 + 1 / n)


class Baseline:
    """The last BASELINE_WINDOWS windows that were not stalls: their starvation, rate and step."""

    def __init__(self, rule: StallRule) -> None:
        self.rule = rule
        self.windows: Deque[Tuple[float, float, float]] = deque(maxlen=BASELINE_WINDOWS)

    def medians(self) -> Tuple[float, float, float]:
        """The baseline's median starvation %, samples/s and seconds a step (NaN before any window)."""
        if not self.windows:
            return float("nan"), float("nan"), float("nan")
        starvation, rate, step = np.median(np.array(self.windows), axis=0)
        return float(starvation), float(rate), float(step)

    def judge(self, window: WindowFigures) -> Optional[Verdict]:
        """The window's verdict (None: no stall); a window that is no stall joins the baseline."""
        ready = len(self.windows) >= MIN_BASELINE_WINDOWS
        verdict = self._verdict(window) if ready and window.steps and window.span_s > 0 else None
        if verdict is None and window.steps and window.span_s > 0 and window.samples > 0:
            self.windows.append((window.starvation_pct, window.samples_per_s, window.span_s / window.steps))
        return verdict

    def _verdict(self, window: WindowFigures) -> Optional[Verdict]:
        figures = np.array(self.windows)
        starvation, rate, _ = self.medians()
        rule = self.rule
        if (window.starvation_pct - starvation >= rule.min_rise_pct
                and window.starvation_pct > _upper_bound(figures[:, 0], rule.alpha)):
            lost = window.wait_s - starvation / 100 * window.span_s
            return Verdict(STARVATION_RISE, starvation, rate, max(lost, 0.0))
        if window.samples > 0 and rate > 0 and window.samples_per_s <= (1 - rule.min_drop) * rate:
            logs = np.log(figures[:, 1])
            if -math.log(window.samples_per_s) > _upper_bound(-logs, rule.alpha):
                lost = window.span_s - window.samples / rate
                return Verdict(RATE_DROP, starvation, rate, max(lost, 0.0))
        return None

    def epoch_start(self, wait_s: float) -> Tuple[float, bool]:
        """An epoch's first batch waited `wait_s`: its cost (less a baseline step's wait) and whether
        it is a stall. Before any baseline, the wait is the cost, judged by `epoch_min_s` alone."""
        starvation, _, step = self.medians()
        usual = 0.0 if math.isnan(step) else starvation / 100 * step
        cost = max(wait_s - usual, 0.0)
        steps_worth = math.inf if math.isnan(step) or step <= 0 else cost / step
        return cost, cost >= self.rule.epoch_min_s and steps_worth >= self.rule.epoch_min_steps
