"""The recorder's own time in the user's loop (`recorder_pct`): a cost planted on the fake clock (a sink
that costs a window's close, a tap that costs every batch) reads back exactly as its share of the
window's span, and stays out of the data wait; a window with no recorder work reads 0."""

import csv

import numpy as np
import pytest
from recorder_sim_kit import FakeClock

from pipebench.attach.recorder import SERIES_CSV, RecordSettings, Recorder
from pipebench.base.typed_json import parse_all
from pipebench.measure.series_window import WindowSums
from pipebench.report.recorded import RecordedRow, recorder_share

MS = 1_000_000
# series.csv's cells are rounded to 4 decimals (series_window.series_cell).
CELL = 1e-4
WAIT_MS, STEP_MS, EVERY = 1, 9, 10


class CostlySink:
    """A sink whose every window row costs `cost_ms` on the fake clock."""

    def __init__(self, clock: FakeClock, cost_ms: int) -> None:
        self.clock, self.cost_ms = clock, cost_ms

    def __call__(self, kind: str, row) -> None:
        if kind == "window":
            self.clock.now += self.cost_ms * MS

    def close(self) -> None:
        pass


def recorded_rows(tmp_path, clock, sink=None, timings=None):
    """31 batches of one epoch (the first its start, then 3 windows of 10 steps), each waiting WAIT_MS
    in next() and stepping STEP_MS; `timings` ride in through the tap with each batch."""
    recorder = Recorder(tmp_path, RecordSettings(every_steps=EVERY), sink=sink, clock=clock)
    loader = recorder.loader("loader=a.py:1")

    def batches():
        for _ in range(31):
            clock.now += WAIT_MS * MS
            if timings is not None:
                loader.timings(timings)
            yield np.zeros(8)

    for _ in loader.epoch(batches(), 8):
        clock.now += STEP_MS * MS
    recorder.close()
    with open(tmp_path / SERIES_CSV, newline="") as f:
        return list(csv.DictReader(f))


def test_a_windows_close_costs_the_next_window_its_share_and_no_data_wait(tmp_path):
    clock = FakeClock()
    rows = recorded_rows(tmp_path, clock, CostlySink(clock, 5))
    assert [r["first_step"] for r in rows] == ["2", "12", "22"]
    assert float(rows[0]["recorder_pct"]) == 0.0  # no close before it: no recorder work in it
    span_ms = EVERY * (WAIT_MS + STEP_MS) + 5
    for row in rows[1:]:  # the close of the window before, 5 ms in a span of 105
        assert float(row["recorder_pct"]) == pytest.approx(100 * 5 / span_ms, abs=CELL)
        assert float(row["starvation_pct"]) == pytest.approx(100 * EVERY * WAIT_MS / span_ms, abs=CELL)
        assert float(row["samples_per_s"]) == pytest.approx(EVERY * 8 / (span_ms / 1000), abs=CELL)
    share = recorder_share(parse_all(RecordedRow, rows))
    assert share.pct == pytest.approx(100 * 10 / (3 * EVERY * (WAIT_MS + STEP_MS) + 10), abs=CELL)  # time-weighted
    assert share.windows == 3 and share.worst.first_step == "12"


def test_a_taps_cost_reads_as_its_share_of_every_window(tmp_path, monkeypatch):
    clock = FakeClock()
    summed = WindowSums.timings

    def costly(window, timings):  # the tap's own work costs 2 ms a batch
        clock.now += 2 * MS
        summed(window, timings)

    monkeypatch.setattr(WindowSums, "timings", costly)
    timings = (np.ones((8, 2), np.int64), np.ones(8, np.int64), 1, 1)
    rows = recorded_rows(tmp_path, clock, timings=timings)
    span_ms = EVERY * (WAIT_MS + 2 + STEP_MS)
    # The epoch's first batch is no step of a window, its tap counts in the window it opened.
    assert float(rows[0]["recorder_pct"]) == pytest.approx(100 * (EVERY + 1) * 2 / span_ms, abs=CELL)
    assert [float(r["recorder_pct"]) for r in rows[1:]] == pytest.approx([100 * EVERY * 2 / span_ms] * 2, abs=CELL)
    assert float(rows[1]["starvation_pct"]) == pytest.approx(100 * EVERY * WAIT_MS / span_ms, abs=CELL)
    assert float(rows[1]["wait_p50_ms"]) == pytest.approx(WAIT_MS, rel=0.02)  # the tap's 2 ms in no wait


def test_nothing_planted_reads_0_and_a_series_without_the_column_has_no_share(tmp_path):
    rows = recorded_rows(tmp_path, FakeClock())
    assert [float(r["recorder_pct"]) for r in rows] == [0.0] * 3
    assert recorder_share(parse_all(RecordedRow, [{**r, "recorder_pct": ""} for r in rows])) is None
