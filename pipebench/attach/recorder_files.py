"""The recorder's files: rows appended and flushed as written, and a stall's capture folder.

`AppendedCsv` appends each row with `pipebench.base.io.append_lines`: rows are never rewritten, so
a crash (SIGKILL, a dead node) loses at most the window in progress, and the ranks of a torchrun
job append to one file. `Captures` keeps at most K `capture-N/` folders, the worst stalls by the
time they lost.
"""

import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from pipebench.base.csv_cells import csv_line, csv_text
from pipebench.base.io import append_lines, write_json_atomic, write_text_atomic
from pipebench.measure.series_window import series_cell
from pipebench.record.results import TRANSFORM_COLUMNS

__all__ = ["CAPTURE_COLUMNS", "CAPTURE_FOLDER", "CAPTURE_JSON", "CAPTURE_TRANSFORMS", "DEFAULT_MAX_CAPTURES",
           "AppendedCsv", "Captures"]

CAPTURE_FOLDER = "capture-{num}"
CAPTURE_JSON = "capture.json"
CAPTURE_TRANSFORMS = "transforms.csv"
# A capture's transforms.csv: the columns `pipebench run` writes, and the step's ms a sample in the
# baseline windows beside it, so the step that changed reads off one row.
CAPTURE_COLUMNS = (*TRANSFORM_COLUMNS, "baseline_ms_per_sample")
# A week-long run with a stall an epoch would otherwise fill the disk with folders no one reads:
# the 10 worst are what a person takes apart.
DEFAULT_MAX_CAPTURES = 10


class AppendedCsv:
    """A CSV file rows are only appended to, each flushed to the disk as it is written."""

    def __init__(self, path: Path, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)
        self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size == 0:
            append_lines(self._fd, csv_line(self.columns))

    def append(self, row: Mapping[str, Any]) -> None:
        """One row, its cells in the file's columns (a missing one empty)."""
        append_lines(self._fd, csv_line([series_cell(row.get(column)) for column in self.columns]))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Captures:
    """At most `limit` capture folders under `folder`, the worst (most time lost) kept."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self._kept: Dict[int, float] = {}
        self._next = 1

    def open(self, lost_s: float) -> Optional[int]:
        """The number of a new capture of a stall that lost `lost_s`; None where the K kept are all
        worse. A capture that is better than the new one goes to make room."""
        if self.limit <= 0:
            return None
        if len(self._kept) >= self.limit:
            least = min(self._kept, key=self._kept.get)
            if self._kept[least] >= lost_s:
                return None
            del self._kept[least]
            shutil.rmtree(self.path(least), ignore_errors=True)
        num, self._next = self._next, self._next + 1
        self._kept[num] = lost_s
        return num

    def path(self, num: int) -> Path:
        return self.folder / CAPTURE_FOLDER.format(num=num)

    def held(self, num: int) -> bool:
        return num in self._kept

    def write(self, num: int, lost_s: float, record: Mapping[str, Any],
              rows: List[Mapping[str, Any]]) -> None:
        """capture-N/: capture.json (the stall) and transforms.csv (its per-transform rows), written
        whole each time the stall goes on (it is no series: a stall's last state is what counts)."""
        self._kept[num] = lost_s
        path = self.path(num)
        path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path / CAPTURE_TRANSFORMS, csv_text(rows, CAPTURE_COLUMNS))
        write_json_atomic(path / CAPTURE_JSON, dict(record))
