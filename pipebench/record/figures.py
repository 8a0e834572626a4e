"""A job's summary row as the readers see it: the identity and the figures they use, typed.

`Summary.from_row` reads a stored row (result.json's `summary`) tolerantly: a column an older
pipebench did not write reads as None, so old result folders still load. The row's other cells stay
readable by their column names (`extra`, or the row itself: a `Summary` is also the stored mapping,
in its stored order, for the readers that index it).
"""

from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Mapping, Optional

from pipebench.base.mapping_view import MappingView

__all__ = ["Summary"]


def _text(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _whole(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _number(value: Any) -> Optional[float]:
    return None if value is None else float(value)


@dataclass(frozen=True, eq=False)
class Summary(MappingView):
    """One summary row (result.json's `summary`, a summary.csv row): each field is the column of its
    name, None where the row has none."""

    # Identity: the columns a job is named by.
    job: Optional[str]
    dataset: Optional[str]
    transform: Optional[str]
    consumer: Optional[str]
    workers: Optional[int]
    batch_size: Optional[int]
    ranks: Optional[int]
    # The steady-state rate, its interval and the epoch-effective rate beside it.
    samples_per_s: Optional[float]
    samples_per_s_ci_low: Optional[float]
    samples_per_s_ci_high: Optional[float]
    samples_per_s_epoch: Optional[float]
    epoch_restart_s: Optional[float]
    # The consumer's side.
    starvation_pct: Optional[float]
    accel_util_pct: Optional[float]
    syncs_per_step: Optional[float]
    # What a sample costs, and the trip of a batch from a worker.
    cpu_ms_per_sample: Optional[float]
    pipeline_ms_per_sample: Optional[float]
    transfer_ms_median: Optional[float]
    ready_next_ms_median: Optional[float]
    # What the job read from its files a sample (the diagnosis's row-group line).
    read_bytes_per_sample: Optional[float]
    # The whole stored row, every column in its stored order.
    row: Mapping[str, Any]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Summary":
        """The typed view of a stored row; a missing column (an older file) reads as None."""
        return cls(**{name: read(row.get(name)) for name, read in _READERS.items()}, row=row)

    @property
    def extra(self) -> Dict[str, Any]:
        """The row's cells no field types, by column name."""
        return {key: value for key, value in self.row.items() if key not in _READERS}

    def _view(self) -> Mapping[str, Any]:
        return self.row


# How each typed field is read from its column: the identity's whole numbers and names, every other a number.
_WHOLE, _TEXT = ("workers", "batch_size", "ranks"), ("job", "dataset", "transform", "consumer")
_READERS: Dict[str, Callable[[Any], Any]] = {
    f.name: _whole if f.name in _WHOLE else _text if f.name in _TEXT else _number
    for f in fields(Summary) if f.name != "row"}
