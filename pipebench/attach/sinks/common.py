"""What every sink shares: the telemetry extra, and the one line for a library that is missing."""

from dataclasses import asdict, dataclass
from typing import Dict, Optional, Set

from pipebench.base.errors import ConfigError
from pipebench.base.extras import MissingExtra, installed, missing_line

__all__ = ["METRIC_PREFIX", "SINK_METRICS", "TELEMETRY_EXTRA", "WindowPoint", "metric_tags", "metric_values",
           "need"]

# Metrics go under this prefix, so in a run the script already has open they sit apart from its own.
METRIC_PREFIX = "pipebench/"
# The series' columns each sink pushes a window (the rest are names and step numbers): the recorder's
# own share of the loop's time beside starvation, so a dashboard shows what watching it costs.
SINK_METRICS = ("samples_per_s", "starvation_pct", "recorder_pct", "wait_p50_ms", "wait_p95_ms", "wait_p99_ms")

# The extra that brings every sink's library.
TELEMETRY_EXTRA = "telemetry"


def need(module: str, flag: str, library: str) -> None:
    """Raise the one-line ConfigError (exit 2, before the script runs) when `module` is missing."""
    if not installed(module):
        raise ConfigError(missing_line([MissingExtra(flag, library, TELEMETRY_EXTRA)]))


@dataclass(frozen=True)
class WindowPoint:
    """What the sinks read of a window's row of series.csv (`SinkSet` parses it once): its loader,
    rank and last step, and its SINK_METRICS (None where the row has none)."""

    loader: str = ""
    rank: int = 0
    last_step: int = 0
    samples_per_s: Optional[float] = None
    starvation_pct: Optional[float] = None
    recorder_pct: Optional[float] = None
    wait_p50_ms: Optional[float] = None
    wait_p95_ms: Optional[float] = None
    wait_p99_ms: Optional[float] = None

    @property
    def site(self) -> str:
        """The loader's call site (`t.py:3` of `loader=t.py:3,...`)."""
        return str(self.loader).split(",")[0].split("=")[-1]


def metric_values(point: WindowPoint) -> Dict[str, float]:
    """The window's figures a sink pushes (empty and NaN cells left out)."""
    return {key: float(value) for key, value in asdict(point).items()
            if key in SINK_METRICS and isinstance(value, (int, float)) and value == value}


def metric_tags(point: WindowPoint, loaders: Set[str]) -> Dict[str, float]:
    """The window's figures by tag: `pipebench/starvation_pct`, with the loader's site and rank where
    the run has several (`loaders`: the loaders seen so far, this one added)."""
    loaders.add(point.loader)
    where = f"{point.site}/" if len(loaders) > 1 else ""
    rank = f"rank{point.rank}/" if point.rank else ""
    return {f"{METRIC_PREFIX}{rank}{where}{key}": value for key, value in metric_values(point).items()}
