"""The meter protocol: what every instrument around the measured window offers the job.

A meter is built before the loader's workers start, started before the first repeat, marked at the
first and last measured step of the first repeat, and stopped once the repeats end (also when they
fail). Adding a meter means one class subclassing Meter (whose methods, but `columns` and `record`,
do nothing by default) and one field of job_run.JobMeters.
A meter never fails a job for "not available": it leaves None cells and says why.
"""

from typing import Any, Dict, Iterable, Mapping, Optional, Protocol, runtime_checkable

from pipebench.record.figures import Summary

__all__ = ["FIRST_MEASURED", "LAST_MEASURED", "Meter", "add_notes"]

# The step loop's marks: the first and the last measured step of the first repeat.
FIRST_MEASURED, LAST_MEASURED = "first_measured", "last_measured"


@runtime_checkable
class Meter(Protocol):
    key: str  # its section of result.json: "memory", "coverage", "gpu"
    # Whether its readings take long enough to hold the step loop while workers run on (the memory
    # meter walks every process's page tables): such meters are marked first, and the loop drains
    # what the workers made meanwhile before the others' marks and the clock start.
    holds_loop: bool = False

    def start(self) -> None:
        """Before the first repeat. Creates no CUDA context: workers may fork later."""

    def mark(self, name: str) -> None:
        """FIRST_MEASURED or LAST_MEASURED; a meter may ignore either."""

    def stop(self) -> object:
        """Idempotent; joins threads and takes the last readings. Callers ignore what it returns."""

    def columns(self) -> Mapping[str, Optional[Any]]:
        """The summary cells this meter owns; None is an empty cell (not measured)."""

    def record(self) -> Mapping[str, Any]:
        """JSON-ready detail for result.json[key]."""

    @staticmethod
    def notes(summary: Summary) -> Mapping[str, str]:
        """Lines this meter adds to the row's note columns (`window_note`, `gpu_notes`), by column.
        Read from the whole summary row alone, never the meter's state, so a row merged from ranks,
        which has no meter, gets its notes by the same rule (`add_notes` over the meters' classes)."""
        return {}


def add_notes(summary: Dict[str, Any], meters: Iterable[Any]) -> None:
    """Append each meter's notes (`Meter.notes`: meters or their classes) to `summary`'s note
    columns, after what the columns already say; the one place a job's and a rank merge's rows get them."""
    row = Summary.from_row(summary)
    for notes in [meter.notes(row) for meter in meters]:  # each read from the row before any is added
        for column, line in notes.items():
            summary[column] = "; ".join(filter(None, (summary.get(column), line)))
