"""The storage check's own words on its command line: `workload=`, `accelerator=` and `storage_check.*`,
taken off the overrides the jobs get; each checked, a bad one as one line naming the key."""

from dataclasses import asdict, dataclass
from typing import ClassVar, List, Optional, Sequence, Tuple

from pipebench.config.limits import MAX_RANKS, MAX_REPEATS
from pipebench.config.specs import Checked
from pipebench.config.verb_options import split_prefixed
from pipebench.storage_track.rules import RUNS

__all__ = ["CheckKeys", "CheckOptions", "PREFIX", "split_check_overrides"]

PREFIX = "storage_check."
WORKLOAD, ACCELERATOR = "workload", "accelerator"
# The most emulated accelerators the search tries unless told: a rank a core of a 64-core host is
# already past what one host's loaders feed; storage_check.max_accelerators raises it to MAX_RANKS.
DEFAULT_MAX_ACCELERATORS = 64


@dataclass(frozen=True)
class CheckKeys(Checked):
    """`storage_check.*`, range-checked."""

    # The runs after the warm-up (MLPerf Storage's 5); fewer shortens the procedure, and the verdict says so.
    runs: int = RUNS
    max_accelerators: int = DEFAULT_MAX_ACCELERATORS
    # workload=custom's minimum AU (a preset has its own).
    min_au_pct: Optional[float] = None

    PREFIX: ClassVar = PREFIX
    RANGES: ClassVar = {"runs": (1, MAX_REPEATS), "max_accelerators": (1, MAX_RANKS), "min_au_pct": (0, 100)}


@dataclass(frozen=True)
class CheckOptions(CheckKeys):
    """The keys and the bare `workload=` and `accelerator=`, which name a preset (no `storage_check.` form)."""

    workload: Optional[str] = None
    accelerator: Optional[str] = None


def split_check_overrides(overrides: Sequence[str]) -> Tuple[CheckOptions, List[str]]:
    """The check's options, and the overrides left for its jobs, in their order."""
    bare = [o for o in overrides if o.partition("=")[0] in (WORKLOAD, ACCELERATOR)]
    keys, rest = split_prefixed([o for o in overrides if o not in bare], PREFIX, CheckKeys)
    return CheckOptions(**asdict(keys), **dict(o.split("=", 1) for o in bare)), rest
