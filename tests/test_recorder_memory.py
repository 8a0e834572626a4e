"""The recorder's memory over a long run (issue 52's target: within 5 MiB, bounded whatever the run's
length): the real recorder through a simulated run (`recorder_sim_kit`), read by tracemalloc. A
million steps is `benchmarks/recorder_check.py --memory-steps`; here 100,000, in which a list of
every wait would grow by ~1.3 MiB a half, and a list of every window by tens of KiB."""

import csv
import os

import pytest
from recorder_sim_kit import EVERY_STEPS, LATE_STALL_AT, simulated_run

STEPS = 100_000
TARGET_BYTES = 5 << 20
# What the second half may add when nothing grows with the steps: a few bins of the run's sketch and
# the allocator's own slack (136 B read over 37,500 steps); one WindowFigures kept a
# window (620 B) would be 23 KiB, a list of every wait 1.3 MiB.
SECOND_HALF_SLACK = 16 << 10


@pytest.mark.slow  # 100,000 steps under tracemalloc: about 5 s on a quiet core, 25 s on a loaded 2-core VM
def test_the_recorders_memory_stays_within_5_mib_and_does_not_grow_with_the_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # each row's fsync costs time, not memory
    # Both halves inside the late stall, which never ends: its capture goes on the whole time.
    warm, half, end = STEPS // 4, STEPS * 5 // 8, STEPS - EVERY_STEPS
    assert warm > STEPS * LATE_STALL_AT
    run = simulated_run(tmp_path, STEPS, (warm, half, end))
    assert run.steps == STEPS and len(run.traced) == 3
    first, second = run.at(half) - run.at(warm), run.at(end) - run.at(half)
    assert run.at(end) <= TARGET_BYTES, f"{run.at(end) / 2**20:.2f} MiB at the end"
    assert second <= SECOND_HALF_SLACK, f"grew {first} B over the first half, {second} B over the second"
    # The run was recorded as a run is: a row a window, the stalls caught with their captures.
    with open(tmp_path / "series.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == STEPS // EVERY_STEPS and rows[-1]["last_step"] == str(STEPS)  # epoch starts are no steps
    assert sorted(p.name for p in tmp_path.glob("capture-*"))  # at least one
    assert "epoch_start" in (tmp_path / "events.csv").read_text()
