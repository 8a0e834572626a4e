"""The storage check's own words on its command line: `workload=`, `accelerator=` and `storage_check.*`,
taken off the overrides the jobs get; each checked, a bad one as one line naming the key."""

from dataclasses import dataclass, fields
from typing import List, Optional, Sequence, Tuple

from pipebench.base.errors import ConfigError
from pipebench.config.limits import MAX_RANKS, MAX_REPEATS
from pipebench.storage_track.rules import RUNS

__all__ = ["CheckOptions", "PREFIX", "split_check_overrides", "user_value"]

PREFIX = "storage_check."
WORKLOAD, ACCELERATOR = "workload", "accelerator"
# The most emulated accelerators the search tries unless told: a rank a core of a 64-core host is
# already past what one host's loaders feed; storage_check.max_accelerators raises it to MAX_RANKS.
DEFAULT_MAX_ACCELERATORS = 64


@dataclass(frozen=True)
class CheckOptions:
    workload: Optional[str] = None
    accelerator: Optional[str] = None
    # The runs after the warm-up (MLPerf Storage's 5); fewer shortens the procedure, and the verdict says so.
    runs: int = RUNS
    max_accelerators: int = DEFAULT_MAX_ACCELERATORS
    # workload=custom's minimum AU (a preset has its own).
    min_au_pct: Optional[float] = None


def _number(key: str, text: str, integer: bool, low: float, high: float) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{key} must be {kind} in [{low:g}, {high:g}], got {text!r}")
    return value


def split_check_overrides(overrides: Sequence[str]) -> Tuple[CheckOptions, List[str]]:
    """The check's options, and the overrides left for its jobs, in their order."""
    found, rest = {}, []
    names = [f.name for f in fields(CheckOptions)]
    for override in overrides:
        key, _, value = override.partition("=")
        if key in (WORKLOAD, ACCELERATOR):
            found[key] = value
        elif key.startswith(PREFIX):
            name = key[len(PREFIX):]
            if name not in names or name in (WORKLOAD, ACCELERATOR):
                known = ", ".join(PREFIX + n for n in names if n not in (WORKLOAD, ACCELERATOR))
                raise ConfigError(f"{key}: no such key (keys: {known})")
            if name == "runs":
                found[name] = _number(key, value, True, 1, MAX_REPEATS)
            elif name == "max_accelerators":
                found[name] = _number(key, value, True, 1, MAX_RANKS)
            else:
                found[name] = _number(key, value, False, 0.0, 100.0)
        else:
            rest.append(override)
    return CheckOptions(**found), rest


def user_value(overrides: Sequence[str], key: str) -> Optional[str]:
    """The last value the user's overrides give `key`, None when none does."""
    values = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+~") == key]
    return values[-1] if values else None
