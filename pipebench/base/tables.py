"""Plain markdown tables: what the terminal shows is what summary.md holds, ready for a PR."""

import math
from typing import Mapping, Sequence

# Significant figures for measured values; the noise on shared machines makes more meaningless.
SIGNIFICANT_FIGURES = 4


def format_value(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        return f"{value:.{SIGNIFICANT_FIGURES}g}" if abs(value) < 10 ** SIGNIFICANT_FIGURES else f"{value:.0f}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str], right: Sequence[str] = ()) -> str:
    """A GitHub-flavoured markdown table; numbers, and the columns named in `right`, right-aligned."""
    if not rows:
        return "(no rows)\n"
    cells = [[format_value(row.get(c)) for c in columns] for row in rows]
    numeric = [c in right or all(isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
                   for row in rows) for c in columns]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)) + "|"
    return "\n".join([line(columns), rule, *(line(r) for r in cells)]) + "\n"
