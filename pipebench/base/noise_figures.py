"""Significant figures that follow the measured noise, in the manner of torch.utils.benchmark.Compare.

Compare (torch/utils/benchmark/utils/common.py and compare.py) estimates an interval of each
median, derives its significant figures from it (at least 1, at most 4), rounds each value to its
own figures, and prints a whole column with the fewest decimals any of its values earned, so the
column lines up and no value claims digits its noise cannot back. pipebench does the same with
one change: Compare keeps floor(log10(median / interval)) figures, which can drop a digit the
noise supports (242 ± 5.5 becomes "200", a 17% error from a 2% noise). pipebench rounds a value
to its interval the way the Particle Data Group rounds a measurement to its error: read the
interval's three leading digits; from 100 to 354 keep two digits of the interval, otherwise one,
and keep the value's digits down to that place (242 ± 5.5 -> "242", 242 ± 40 -> "240",
154 ± 107 -> "150", where a one-digit rule would print "200").
"""

import math
from typing import List, Sequence, Tuple

import numpy as np

# Compare's bounds (common._MAX_SIGNIFICANT_FIGURES): at least one figure is always shown, and
# no timing earns more than four.
MIN_SIGNIFICANT_FIGURES, MAX_SIGNIFICANT_FIGURES = 1, 4
# Compare's z for the interval of a median from the repeats' interquartile points (about 90%);
# a static z, as Compare says, because the number of repeats is not small enough to need t.
COMPARE_Z = 1.645
# Quartiles bounding the points that estimate that interval, as Compare takes them.
LOWER_QUARTER, UPPER_QUARTER = 0.25, 0.75
# The PDG rule: an interval whose three leading digits are below 355 keeps two digits (a leading
# 1 or low 3 loses too much as one digit: 107 -> 100), from 355 up one digit.
TWO_DIGIT_LIMIT = 355


def significant_figures(value: float, half_width: float) -> int:
    """Figures of `value` down to the last place the PDG rule keeps of ± half_width, clamped to [1, 4].

    An unknown (NaN) or zero interval gets the maximum, as Compare's minimum interval does.
    """
    if not (math.isfinite(value) and value != 0 and math.isfinite(half_width) and half_width > 0):
        return MAX_SIGNIFICANT_FIGURES
    exponent = math.floor(math.log10(half_width))
    leading = half_width / 10.0 ** (exponent - 2)  # the three leading digits, 100 <= leading < 1000
    last_place = exponent - 1 if leading < TWO_DIGIT_LIMIT else exponent
    figures = math.floor(math.log10(abs(value))) - last_place + 1
    return int(min(max(figures, MIN_SIGNIFICANT_FIGURES), MAX_SIGNIFICANT_FIGURES))


def compare_half_width(values: Sequence[float]) -> float:
    """Compare's interval of a median: z x the std of the interquartile points / sqrt(their count)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    n = ordered.size
    middle = ordered[int(n * LOWER_QUARTER):int(math.ceil(n * UPPER_QUARTER))]
    if middle.size == 0:
        return float("nan")
    return float(COMPARE_Z * middle.std() / math.sqrt(middle.size))


def ratio_figures(ratio: float, relative_noises: Sequence[float]) -> int:
    """Figures of a ratio whose two sides carry these relative half-widths (added in quadrature)."""
    finite = [r for r in relative_noises if math.isfinite(r)]
    relative = math.sqrt(sum(r * r for r in finite))
    return significant_figures(ratio, abs(ratio) * relative)


def _leading_digits(value: float) -> int:
    return int(math.ceil(math.log10(abs(value))))


def trim_significant(value: float, figures: int) -> float:
    """value rounded to `figures` significant figures (3.14159, 2 -> 3.1), as Compare's trim_sigfig."""
    if not math.isfinite(value) or value == 0:
        return value
    scale = 10.0 ** (_leading_digits(value) - figures)
    return round(value / scale) * scale


def format_column(values: Sequence[float], figures: Sequence[int]) -> Tuple[List[str], int]:
    """Each value trimmed to its own figures, all printed with the column's decimals (the fewest any value
    earned: Compare's one template per column); and those decimals."""
    decimals = min((max(f - _leading_digits(v), 0) for v, f in zip(values, figures) if math.isfinite(v) and v != 0),
                   default=0)
    cells = [f"{trim_significant(v, f):.{decimals}f}" if math.isfinite(v) else "nan"
             for v, f in zip(values, figures)]
    return cells, decimals
