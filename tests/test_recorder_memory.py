"""The recorder's memory over a long run (issue 52's target: within 5 MiB, bounded whatever the run's
length): the real recorder through a simulated run (`recorder_sim_kit`), read by tracemalloc. A
million steps is `benchmarks/recorder_check.py --memory-steps`; here 50,000 with the kit's run pressed
to half (a window every 500 steps, an epoch every 2,500): the same 100 windows, epochs, stalls and
captures as 100,000 steps at the kit's own lengths, in which a list of every wait would still grow by
~0.65 MiB a half, and a list of every window by tens of KiB."""

import csv
import os

import pytest
import recorder_sim_kit
from recorder_sim_kit import LATE_STALL_AT, simulated_run

# Half the steps of the run this test first simulated (100,000 at a window every 1,000 and an epoch
# every 5,000), each window and epoch half as long: the run's every event (windows, epochs, epoch-start
# and one-window stalls, captures) comes as often, and tracemalloc's per-step cost, most of the test's
# time (5.7 s against 3.7 s here), halves. A window still reaches KEPT_BATCHES (256) batches.
STEPS = 50_000
WINDOW_STEPS = recorder_sim_kit.EVERY_STEPS // 2
EPOCH_STEPS = recorder_sim_kit.EPOCH_STEPS // 2
TARGET_BYTES = 5 << 20
# What the second half may add when nothing grows with the steps: a few bins of the run's sketch and
# the allocator's own slack (136 B read over 37,500 steps at the kit's lengths, 160 B over 18,750 at
# half of them); one WindowFigures kept a window (620 B) would be 23 KiB, a list of every wait 0.65 MiB.
SECOND_HALF_SLACK = 16 << 10


@pytest.mark.slow  # 50,000 steps under tracemalloc: about 3.5 s on a quiet core, 15 s on a loaded 2-core VM
def test_the_recorders_memory_stays_within_5_mib_and_does_not_grow_with_the_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # each row's fsync costs time, not memory
    monkeypatch.setattr(recorder_sim_kit, "EPOCH_STEPS", EPOCH_STEPS)
    # Both halves inside the late stall, which never ends: its capture goes on the whole time.
    warm, half, end = STEPS // 4, STEPS * 5 // 8, STEPS - WINDOW_STEPS
    assert warm > STEPS * LATE_STALL_AT
    run = simulated_run(tmp_path, STEPS, (warm, half, end), every_steps=WINDOW_STEPS)
    assert run.steps == STEPS and len(run.traced) == 3
    first, second = run.at(half) - run.at(warm), run.at(end) - run.at(half)
    assert run.at(end) <= TARGET_BYTES, f"{run.at(end) / 2**20:.2f} MiB at the end"
    assert second <= SECOND_HALF_SLACK, f"grew {first} B over the first half, {second} B over the second"
    # The run was recorded as a run is: a row a window, the stalls caught with their captures.
    with open(tmp_path / "series.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == STEPS // WINDOW_STEPS and rows[-1]["last_step"] == str(STEPS)  # epoch starts are no steps
    assert sorted(p.name for p in tmp_path.glob("capture-*"))  # at least one
    assert "epoch_start" in (tmp_path / "events.csv").read_text()
