"""Sweep shorthands the CLI expands before Hydra sees the overrides: `workers=auto`.

`workers=auto` becomes a comma list (a ladder from 0 to twice the usable cores), so the up-front
checks, the folder label, invocation.json and Hydra all see the same real jobs.
"""

from typing import List, Sequence

# The override that asks for the worker ladder, exactly as typed.
AUTO_WORKERS = "workers=auto"
# Past the core count, extra workers only help while they wait on I/O; twice the cores is
# where the README's measurements (and the seed article's 4 -> 8) stop finding gains.
AUTO_WORKERS_CORE_FACTOR = 2


def worker_ladder(cores: int) -> List[int]:
    """0 (the single-process profile), powers of two, the core count and twice it, sorted:
    1 core -> 0,1,2; 2 -> 0,1,2,4; 6 -> 0,1,2,4,6,8,12; 16 -> 0,1,2,4,8,16,32."""
    top = AUTO_WORKERS_CORE_FACTOR * max(1, cores)
    powers = {1 << k for k in range(top.bit_length()) if 1 << k <= top}
    return sorted({0, max(1, cores), top, *powers})


def expand_auto_workers(overrides: Sequence[str], cores: int) -> List[str]:
    """The overrides with `workers=auto` replaced by the ladder for `cores` usable cores."""
    ladder = ",".join(str(w) for w in worker_ladder(cores))
    return [f"workers={ladder}" if item.strip() == AUTO_WORKERS else item for item in overrides]
