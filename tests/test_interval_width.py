"""The one rule for an interval that says nothing (issue 55): a bound more than MAX_BOUND_FACTOR from
its rate, whatever the count of blocks, leaves the rate without its interval and a note saying why,
for jobs, ranks and attach alike (`pipebench.model.judging.telling`, called by `measure.window.rate_interval`)."""

import math

import pytest

from pipebench.base.stats import RatioInterval, block_ratio_interval
from pipebench.model.judging import MAX_BOUND_FACTOR, telling
from pipebench.measure.steps import PassResult, StepSample, TimingSink
from pipebench.measure.summarize import summary_row
from pipebench.measure.window import split_window

MS = 1_000_000


def test_the_issues_eval_loader_interval_is_not_shown_and_the_note_says_why():
    hidden = telling(RatioInterval(281.7, 76.5, 1036.6, 5))
    assert hidden.value == 281.7 and hidden.blocks == 5
    assert math.isnan(hidden.low) and math.isnan(hidden.high)
    assert "spread too far" in hidden.note and "76.5..1037 around 281.7" in hidden.note


@pytest.mark.parametrize("low, high, shown", [
    (90.0, 110.0, True),
    (100.0 / MAX_BOUND_FACTOR, 100.0 * MAX_BOUND_FACTOR, True),  # at the factor: still shown
    (100.0 / MAX_BOUND_FACTOR * 0.99, 120.0, False),  # a lower bound past it
    (95.0, 100.0 * MAX_BOUND_FACTOR * 1.01, False),  # an upper bound past it
    (95.0, math.inf, False),
])
def test_an_interval_is_shown_while_both_bounds_lie_within_the_factor_of_the_rate(low, high, shown):
    interval = RatioInterval(100.0, low, high, 2)
    assert (telling(interval) == interval) is shown


def test_an_interval_already_missing_keeps_its_own_reason():
    few = block_ratio_interval([32.0], [0.5])
    assert telling(few) == few and "fewer than" in few.note


def test_a_jobs_summary_reads_the_rule_too_however_many_blocks():
    """Nine one-cycle blocks at workers=1, one of them 40x the others: many blocks, an interval past 3x."""
    steps = [StepSample(gap_ns=0, wait_ns=(400 if k == 4 else 10) * MS, h2d_ns=0, compute_ns=0, samples=8,
                        transfer_ns=0, worker_id=0, ready=False, epoch=1) for k in range(9)]
    row = summary_row(split_window([PassResult(0.4, 0, steps, 0.0, 1, {}, 1)], 1), [], TimingSink(), 1, 2, 0)
    assert row["ci_blocks"] == 9 and row["samples_per_s"] > 0
    assert math.isnan(row["samples_per_s_ci_low"]) and "spread too far" in row["ci_note"]
