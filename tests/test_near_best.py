"""The comparison table's ≈ (issue 55): a row is within the noise of the best when its spread reaches
the best's samples/s (or, with rounds enough a side, the rounds are not separated), never merely
because two spreads overlap, and never for a row that has no spread (`pipebench.model.judging`)."""

import math
from pathlib import Path

import pytest

from pipebench.model.judging import reaches
from pipebench.record.jobs import JobResult
from pipebench.report.comparison import NEAR_BEST_MARK, build_table, comparison_markdown, group_rows


def _job(num: int, rate: float, low: float, high: float, round_: int = 0) -> dict:
    label = f"workers={num}"
    overrides = [label] + ([f"run.round={round_}"] if round_ else [])
    return JobResult.from_stored({
        "job": ",".join(overrides), "job_num": num * 10 + round_, "overrides": overrides,
        "config": {"workers": num}, "choices": {"transform": "chain", "dataset": "random_tensors"},
        "summary": {"job": label, "dataset": "random_tensors", "transform": "chain", "workers": num, "batch_size": 32,
                    "consumer": "emulated", "samples_per_s": rate, "samples_per_s_ci_low": low,
                    "samples_per_s_ci_high": high, "starvation_pct": 50.0},
        "transforms": [], "fingerprint": {"hostname": "box", "cpu_model": "cpu", "usable_cores": 2, "gpu": None}})


def _marks(*jobs: dict):
    table = build_table(group_rows([(Path("run"), list(jobs))]), compare_loaders=True)
    return [table.near_best(i) for i in range(len(table.rows))], table


def test_overlapping_spreads_that_stop_short_of_the_best_rate_are_not_within_the_noise():
    # The best: 150 (96-309). 98 (90-107) overlaps it but stops short of 150; 150's twin at 140 reaches it.
    near, table = _marks(_job(0, 98.0, 90.0, 107.0), _job(2, 140.0, 106.0, 247.0), _job(4, 150.0, 96.0, 309.0))
    assert table.best == 2 and near == [False, True, False]
    assert NEAR_BEST_MARK + ": its spread reaches the best's samples/s" in comparison_markdown(table)


def test_a_row_without_a_spread_is_never_within_the_noise():
    """An interval too wide to say anything is left out (stats.telling): it no longer marks its row ≈."""
    nan = math.nan
    near, _ = _marks(_job(0, 281.7, nan, nan), _job(1, 900.0, 880.0, 920.0))
    assert near == [False, False]


def test_rows_with_rounds_enough_a_side_are_read_by_their_rounds():
    best = [_job(1, rate, rate, rate, r) for r, rate in enumerate([1000.0, 1010.0, 990.0, 1005.0], 1)]
    alike = [_job(0, rate, rate, rate, r) for r, rate in enumerate([995.0, 1012.0, 985.0, 1003.0], 1)]
    near, _ = _marks(*alike, *best)
    assert near == [True, False]


@pytest.mark.parametrize("low, high, rate, held", [(90.0, 110.0, 110.0, True), (90.0, 110.0, 110.5, False),
                                                   (math.nan, math.nan, 100.0, False)])
def test_reaches(low, high, rate, held):
    assert reaches(low, high, rate) is held
