"""au_pct: the MLPerf Storage-style AU of a job's measured steps, epoch ends included, the first batch out."""

import pytest

from pipebench.measure.distributed.multirank import aggregate
from pipebench.record.jobs import JobResult
from pipebench.measure.steps import PassResult, StepSample
from pipebench.measure.summarize import au_pct

MS = 1_000_000


def _step(wait_ms: float, compute_ms: float, epoch: int = 1) -> StepSample:
    return StepSample(gap_ns=0, wait_ns=int(wait_ms * MS), h2d_ns=0, compute_ns=int(compute_ms * MS), samples=4,
                      transfer_ns=0, worker_id=0, ready=False, epoch=epoch)


def test_au_is_compute_over_every_measured_step_with_the_first_batch_left_out():
    """Known truth: 9 steps fed at once and one step starved 90 ms at the epoch end, 10 ms compute each:
    AU = 100 x 100 / (100 + 90); the first batch's 5 s wait is outside."""
    steps = [_step(0, 10) for _ in range(9)] + [_step(90, 10, epoch=2)]
    passes = [PassResult(5.0, 3, steps, 0.0, 2, {})]
    assert au_pct(passes) == pytest.approx(100 * 100 / 190)


def test_au_pools_the_steps_of_every_repeat():
    passes = [PassResult(1.0, 0, [_step(0, 10)], 0.0, 1, {}), PassResult(1.0, 0, [_step(30, 10)], 0.0, 1, {})]
    assert au_pct(passes) == pytest.approx(100 * 20 / 50)


def test_a_multirank_row_takes_the_least_ranks_au():
    summaries = [{"samples_per_s": 10.0, "starvation_pct": s, "au_pct": 100 - s, "busy_ms_mean": 1.0,
                  "collective_ms_mean": 0.0} for s in (5.0, 30.0)]
    row = aggregate([JobResult.from_stored({"summary": s}) for s in summaries])
    assert row["au_pct"] == pytest.approx(70.0)
