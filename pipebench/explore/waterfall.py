"""What to do, in order: the winner (the fastest measured chain with an equivalent verdict) and its
waterfall, a rung an edit along the ladder from the base chain: the rate after each edit, that edit's
gain on the way, and its worth alone (its single-move variant against the base), all from one sweep.
"""

from dataclasses import dataclass, fields
from typing import List, Optional, Sequence

from pipebench.explore.equivalence import is_equivalent
from pipebench.explore.chain import Variant
from pipebench.explore.variant_row import BASE_VERDICT, VariantRow
from pipebench.explore.variants import ladder_of


@dataclass(frozen=True)
class Rung:
    """One edit on the way to the winner: a waterfall.csv row."""

    rung: int
    edit: str
    variant: str
    verdict: str
    samples_per_s: float
    step_gain: float
    speedup: float
    alone_speedup: float
    cpu_ms_per_sample: float
    cpu_speedup: float


WATERFALL_COLUMNS = [f.name for f in fields(Rung)]


def allowed(group: Sequence[VariantRow]) -> List[VariantRow]:
    """The rows of one setting that may win: the base chain's and the equivalent variants'."""
    return [r for r in group if r.verdict == BASE_VERDICT or is_equivalent(r.verdict)]


def winner(group: Sequence[VariantRow]) -> Optional[VariantRow]:
    """The fastest equivalent row of one setting (the base row included), or None when none was measured."""
    candidates = allowed(group)
    return max(candidates, key=lambda r: r.samples_per_s) if candidates else None


def waterfall(group: Sequence[VariantRow], variants: Sequence[Variant], best: VariantRow) -> List[Rung]:
    """One row a rung from the base chain to `best` (rows of one setting, keyed by variant name)."""
    rows = {r.variant: r for r in group}
    by_name = {v.name: v for v in variants}
    singles = {v.moves[0]: rows.get(v.name) for v in variants if len(v.moves) == 1}
    path = [v for v in ladder_of(by_name[best.variant], variants) if v.name in rows]
    out: List[Rung] = []
    previous: Optional[VariantRow] = None
    for rung, variant in enumerate(path):
        row = rows[variant.name]
        move = variant.moves[-1] if variant.moves else "-"
        alone = singles.get(move)
        added = variant.changes[len(by_name[previous.variant].changes):] if previous is not None else ()
        out.append(Rung(rung, "; ".join(added) or "the chain as configured", variant.name, row.verdict,
                        row.samples_per_s, row.samples_per_s / previous.samples_per_s if previous else 1.0,
                        row.speedup, alone.speedup if alone else float("nan"), row.cpu_ms_per_sample,
                        row.cpu_speedup))
        previous = row
    return out
