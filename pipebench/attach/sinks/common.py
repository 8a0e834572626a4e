"""What every sink shares: the telemetry extra, and the one line for a library that is missing."""

from typing import Any, Dict

from pipebench.base.errors import ConfigError
from pipebench.base.extras import MissingExtra, installed, missing_line

__all__ = ["METRIC_PREFIX", "SINK_METRICS", "TELEMETRY_EXTRA", "metric_tag", "metric_values", "need"]

# Metrics go under this prefix, so in a run the script already has open they sit apart from its own.
METRIC_PREFIX = "pipebench/"
# The series' columns each sink pushes a window (the rest are names and step numbers).
SINK_METRICS = ("samples_per_s", "starvation_pct", "wait_p50_ms", "wait_p95_ms", "wait_p99_ms")

# The extra that brings every sink's library.
TELEMETRY_EXTRA = "telemetry"


def need(module: str, flag: str, library: str) -> None:
    """Raise the one-line ConfigError (exit 2, before the script runs) when `module` is missing."""
    if not installed(module):
        raise ConfigError(missing_line([MissingExtra(flag, library, TELEMETRY_EXTRA)]))


def metric_values(row: Dict[str, Any]) -> Dict[str, float]:
    """The row's figures a sink pushes (empty and NaN cells left out)."""
    values = {}
    for key in SINK_METRICS:
        value = row.get(key)
        if isinstance(value, (int, float)) and value == value:
            values[key] = float(value)
    return values


def metric_tag(row: Dict[str, Any], key: str, loaders: int) -> str:
    """`pipebench/starvation_pct`, with the loader's site and rank where the run has several."""
    site = str(row.get("loader", "")).split(",")[0].split("=")[-1]
    where = f"{site}/" if loaders > 1 else ""
    rank = f"rank{row['rank']}/" if row.get("rank") else ""
    return f"{METRIC_PREFIX}{rank}{where}{key}"
