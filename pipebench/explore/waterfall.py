"""What to do, in order: the winning chain, the edits that make it, and what each is worth.

The winner is the fastest measured chain with an equivalent verdict (a `not equivalent` chain
never wins). Its waterfall walks the ladder of variants from the base chain to it, one edit a
rung: the rate after each edit, the gain of that edit on the way, and the edit's worth on its
own (its single-move variant against the base chain), all measured in the same sweep.
"""

from typing import Dict, List, Mapping, Optional, Sequence

from pipebench.explore.equivalence import is_equivalent
from pipebench.explore.chain import Variant
from pipebench.explore.variants import ladder_of

WATERFALL_COLUMNS = ["rung", "edit", "variant", "verdict", "samples_per_s", "step_gain", "speedup", "alone_speedup",
                     "cpu_ms_per_sample", "cpu_speedup"]
BASE_VERDICT = "base"


def winner(group: Sequence[Mapping[str, object]]) -> Optional[Mapping[str, object]]:
    """The fastest equivalent row of one setting (the base row included), or None when none was measured."""
    allowed = [r for r in group if r["verdict"] == BASE_VERDICT or is_equivalent(str(r["verdict"]))]
    return max(allowed, key=lambda r: r["samples_per_s"]) if allowed else None


def waterfall(group: Sequence[Mapping[str, object]], variants: Sequence[Variant],
              best: Mapping[str, object]) -> List[Dict[str, object]]:
    """One row a rung from the base chain to `best` (rows of one setting, keyed by variant name)."""
    rows = {str(r["variant"]): r for r in group}
    by_name = {v.name: v for v in variants}
    singles = {v.moves[0]: rows.get(v.name) for v in variants if len(v.moves) == 1}
    path = [v for v in ladder_of(by_name[str(best["variant"])], variants) if v.name in rows]
    out: List[Dict[str, object]] = []
    previous: Optional[Mapping[str, object]] = None
    for rung, variant in enumerate(path):
        row = rows[variant.name]
        move = variant.moves[-1] if variant.moves else "-"
        alone = singles.get(move)
        added = variant.changes[len(by_name[str(previous["variant"])].changes):] if previous is not None else ()
        out.append({"rung": rung, "edit": "; ".join(added) or "the chain as configured", "variant": variant.name,
                    "verdict": row["verdict"], "samples_per_s": row["samples_per_s"],
                    "step_gain": row["samples_per_s"] / previous["samples_per_s"] if previous else 1.0,
                    "speedup": row["speedup"], "alone_speedup": alone["speedup"] if alone else float("nan"),
                    "cpu_ms_per_sample": row["cpu_ms_per_sample"], "cpu_speedup": row["cpu_speedup"]})
        previous = row
    return out
