"""AU (`au_pct`) in what attach and pipebench.watch report: a watched window on a planted clock, whose
waits and steps are known, read back as the WatchResult, the printed table and the rank merge."""

import types

import pytest
import torch

import pipebench.attach.watch as watch_module
from pipebench.attach.watch import WatchWindow
from pipebench.attach.watched import Watched, summary_line
from pipebench.attach.watched_ranks import RANKS_DIR_ENV, merge_ranks, save_rank
from pipebench.base.tables import markdown_table
from pipebench.cli.attach import SUMMARY_TABLE_COLUMNS

MS = 1_000_000
# The run's first batch and the warm-up steps wait far longer than any measured step: counted in
# AU, they would pull it far below the truth.
FIRST_BATCH_MS, WARMUP_MS, SKIP_STEPS = 1000, 500, 2
STEP_MS = 6


class PlantedLoader:
    """An iterable of batches of 4 whose next() takes the planted wait (ms): one list an epoch."""

    batch_size = 4

    def __init__(self, clock: types.SimpleNamespace, epochs: list) -> None:
        self.clock, self.epochs = clock, iter(epochs)

    def __iter__(self):
        for wait in next(self.epochs):
            self.clock.now += wait * MS
            yield torch.zeros(self.batch_size)


@pytest.fixture
def clock(monkeypatch):
    """The watch's perf_counter_ns, planted: time moves only where the test moves it (`clock.now`)."""
    planted = types.SimpleNamespace(now=0)
    monkeypatch.setattr(watch_module, "time", types.SimpleNamespace(perf_counter_ns=lambda: planted.now))
    return planted


def watched_run(clock: types.SimpleNamespace, epochs: list, steps: int) -> Watched:
    """The loop a user writes: every batch followed by a step of STEP_MS."""
    watched = Watched(PlantedLoader(clock, epochs), WatchWindow(steps=steps, skip_steps=SKIP_STEPS, seconds=1e6,
                                                                replay=0))
    for _ in epochs:
        for _batch in watched:
            clock.now += STEP_MS * MS
    watched.close()
    return watched


def test_au_is_the_step_share_of_every_measured_step_first_batch_and_warm_up_left_out(clock):
    # Epoch 1: the first batch, 2 warm-up steps, 4 measured steps waiting 2 ms. Epoch 2 starts inside
    # the window: its first batch is a measured step (a restart of 50 ms), then 3 steps of 2 ms.
    epochs = [[FIRST_BATCH_MS] + [WARMUP_MS] * SKIP_STEPS + [2] * 4, [50] + [2] * 3]
    result = watched_run(clock, epochs, steps=8).result()
    truth = 100 * 8 * STEP_MS / (8 * STEP_MS + 7 * 2 + 50)  # 42.9: the restart in, as for a job
    assert result.steps_measured == 8
    assert result.au_pct == pytest.approx(truth)
    assert result.record.summary.au_pct == pytest.approx(truth)
    table = markdown_table([summary_line(result)], SUMMARY_TABLE_COLUMNS)
    header, _, row = table.splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["au_pct"] == f"{truth:.1f}"


def test_the_rank_merge_keeps_the_least_ranks_au_and_each_ranks_own(clock, tmp_path, monkeypatch):
    ranks_dir = tmp_path / "ranks"
    monkeypatch.setenv(RANKS_DIR_ENV, str(ranks_dir))
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, wait in enumerate([2, 6]):  # AU 75% and 50%
        monkeypatch.setenv("RANK", str(rank))
        watched = watched_run(clock, [[FIRST_BATCH_MS] + [WARMUP_MS] * SKIP_STEPS + [wait] * 8], steps=8)
        save_rank([watched.watch], 0)
    [merged] = merge_ranks(ranks_dir, tmp_path)
    assert [(r["rank"], r["au_pct"]) for r in merged.sections["ranks"]] == [(0, pytest.approx(75.0)), (1, pytest.approx(50.0))]
    assert merged.summary.au_pct == pytest.approx(50.0)
