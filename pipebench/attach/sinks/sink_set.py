"""The recorder's sinks: each window's row pushed to the dashboards a user already watches.

Each sink is its ecosystem's own library, optional (`pip install pipebench[telemetry]`): TensorBoard,
MLflow, W&B, Prometheus. `open_sinks` starts the ones asked for before the script runs: one that
cannot start (its library missing, a port taken) is a `ConfigError`, one line and exit 2. Once
running, a sink that fails is one warning and is dropped: the run and the other sinks go on.
"""

from dataclasses import asdict, astuple, dataclass
from typing import Any, Dict, List, Optional, Protocol

from pipebench.attach.sinks.common import WindowPoint
from pipebench.base.errors import ConfigError, warn
from pipebench.base.typed_json import parse

__all__ = ["Sink", "SinkSet", "SinkSpec", "open_sinks"]


class Sink(Protocol):
    name: str

    def window(self, point: WindowPoint) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SinkSpec:
    """Which sinks to start: a TensorBoard log folder, an MLflow tracking URI, a W&B project, a
    Prometheus port (each None: off)."""

    tensorboard: Optional[str] = None
    mlflow: Optional[str] = None
    wandb: Optional[str] = None
    prometheus_port: Optional[int] = None

    @property
    def any(self) -> bool:
        return any(value is not None for value in astuple(self))


class SinkSet:
    """The started sinks; the recorder's sink callable. A sink that raises is warned of once and dropped."""

    def __init__(self, sinks: List[Sink]) -> None:
        self.sinks = list(sinks)

    def __call__(self, kind: str, row: Dict[str, Any]) -> None:
        if kind != "window":
            return
        point = parse(WindowPoint, row)
        for sink in list(self.sinks):
            try:
                sink.window(point)
            except Exception as exc:  # telemetry never stops the user's training
                warn(f"the {sink.name} sink failed ({type(exc).__name__}: {exc}); the run and the series go on "
                     "without it")
                self.sinks.remove(sink)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                warn(f"the {sink.name} sink failed to close ({type(exc).__name__}: {exc})")
        self.sinks = []


def open_sinks(spec: SinkSpec, rank: int = 0) -> SinkSet:
    """Start each sink asked for; ConfigError (the started ones closed) where one cannot start."""
    # Each sink's module imports its library only when it is asked for.
    from pipebench.attach.sinks import mlflow_sink, prometheus_sink, tensorboard_sink, wandb_sink

    modules = {"tensorboard": tensorboard_sink, "mlflow": mlflow_sink, "wandb": wandb_sink,
               "prometheus_port": prometheus_sink}
    started: List[Sink] = []
    try:
        for field_name, value in asdict(spec).items():
            if value is not None:
                started.append(modules[field_name].start(value, rank))
    except ConfigError:
        SinkSet(started).close()
        raise
    return SinkSet(started)
